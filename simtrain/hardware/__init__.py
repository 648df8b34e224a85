"""GPU and node specs, hardware profiles on disk and where they are found."""
