"""The run registry here: the records of runs (SQLite, db.py), their history beyond the current attempt,
and the local copies of their logs. Storage only: what later commands do with a recorded run is runs/."""
