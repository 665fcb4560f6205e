"""What the suite's tests share: sample data and small sources, config folders, the documented
privileges, JVM options and port pickers (imported by tests and by conftest.py's fixtures;
no test module imports another)."""
