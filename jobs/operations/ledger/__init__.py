"""The run ledger and what is built on it (jobs/operations/__init__.py lists the modules)."""
