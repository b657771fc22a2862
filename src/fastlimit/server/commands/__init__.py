"""The commands: the one table in ``table.py`` (``build_table()``), the
entry builders in ``spec.py``, and the handlers by area, one module each.
No area module imports another or the table."""
