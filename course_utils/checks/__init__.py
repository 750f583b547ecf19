"""Exercise definitions, one module per lesson: cases, references, tolerances and hints."""
