"""Records each process that imports it (_import_marks.py)."""
from _import_marks import mark

mark(__name__)
