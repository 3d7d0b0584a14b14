"""The meshspec reference broker: storage (``reference.broker.store``) and a throwaway PostgreSQL for tests."""
