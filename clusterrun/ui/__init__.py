"""The terminal: rich rendering of runs, tables and check reports. With cli/, the only code that prints."""
