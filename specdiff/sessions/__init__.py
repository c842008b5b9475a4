"""Sessions: a pair run as one JSONL file (format), written and read as it streams
(store), listed from a folder (catalog), played back at the recorded pace (playback)
and checked against a re-run (verify). Nothing here loads the engine."""
