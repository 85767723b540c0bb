"""The run registry here (SQLite, local log copies) and what later commands do with recorded runs:
`ps` brings them up to date from their hosts, `logs` fetches by byte offset, `stop` ends them."""
