"""Pure functions for the science: CKA, knowledge scores, statistics. No I/O."""
