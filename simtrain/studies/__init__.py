"""What users ask: one step, whole runs, goodput, sweeps, layout search, comparisons, reports."""
