"""a2a-tune: probe -> sweep -> store -> select -> lookup."""
