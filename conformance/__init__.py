"""The meshspec conformance harness: certify any daemon (and any broker) against the spec."""
