"""`materialize doctor`: is this deployment ready to run, and may each user do what it needs
and only that? run.py runs every check in the order a run needs them; each module here checks
one thing and answers in DoctorLines (line.py: one line each, with what to fix)."""
