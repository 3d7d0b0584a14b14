"""The conformance cases. Each is a pytest test tagged with ``@case(case_id, *requirement_ids)``."""
