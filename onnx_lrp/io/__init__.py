"""Inputs and outputs for users: model inputs read from files (arrays, images) and token heatmaps."""
