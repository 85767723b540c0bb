"""Commands on recorded runs: what `ps`, `stop`, `logs`, `pull`, `forward`, `stacks` and `top` do with a run
the registry (registry/) keeps, any time later and also after the controller that started it is gone. They
reach its hosts again from the record (nodes); the verdicts on how a run ended are outcome.py's."""
