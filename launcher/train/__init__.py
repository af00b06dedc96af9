"""Training: the DNN node (dnn_node: waits for the data servers, starts the ranks), one rank's job
(trainer) and epochs (train_loop), its step timing and metrics.json (step_stats), checkpoints
(checkpoint) and fault injection for drills (faults)."""
