"""Conformance cases for brokers (`meshconform broker`): the harness plays the daemons."""
