"""Model sync: the pure plan (what each node receives, links or keeps; the relay chain; the disk
check) and the stdlib-only agent that runs on the nodes for the length of one sync."""
