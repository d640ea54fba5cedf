"""The software stack: kernels, frameworks and their bytes per parameter, precision recipes, the fitted calibration."""
