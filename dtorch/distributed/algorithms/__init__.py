"""Communication algorithms for DDP (``register_comm_hook``)."""
