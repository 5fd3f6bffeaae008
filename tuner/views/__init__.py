"""What operators read: ``show``, ``diff``, ``plot`` and ``report`` over a selection table
or a stored run. Read-only; a view shows as much of an odd table as it can and says what it
could not read."""
