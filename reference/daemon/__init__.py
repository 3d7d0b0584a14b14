"""The reference daemon: durable storage, the broker link, the IPC server and the CLI around the sans-IO core.

The protocol decisions live in ``reference.core``; this package performs the IO those decisions call for.
"""
