"""The meshspec reference implementation: the sans-IO core, the daemon and the broker."""
