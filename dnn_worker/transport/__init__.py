"""How batches cross the wire: connections to data servers, their send and receive buffers, the handshake and the control-plane client."""
