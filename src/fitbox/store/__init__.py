"""One SQLite file per box: migrations, the call log. Written by the box, read by the core
only through the facts the box hands it."""
