"""Installs :mod:`gemma3_image_shim` in every Python process started with this folder on
``PYTHONPATH`` (the vLLM Gemma-3 image test's subprocesses); see that module for why."""

import gemma3_image_shim

gemma3_image_shim.install()
