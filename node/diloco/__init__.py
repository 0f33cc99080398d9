"""DiLoCo trainer groups (INTELLECT-1): outer step, int8 ring all-reduce, membership."""
