"""A recipe compiled into a lazy plan over its sources, with the report a run would give."""
