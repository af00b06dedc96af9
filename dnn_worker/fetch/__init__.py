"""Which batch to ask of which server, and when: the fetch engine (server set, scheduler, lanes, in-order delivery, block affinity, registry watch) and its options."""
