"""Stage 7, report: summary.py is the run summary (the console table and its JSON);
stage.py writes it under ``<reports_dir>/<source>/<date>/`` (also on failure) and reads it back."""
