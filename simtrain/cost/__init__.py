"""The cost pass: roofline and calibrated kernel costs, collective algorithms."""
