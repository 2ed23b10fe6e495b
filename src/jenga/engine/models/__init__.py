"""Paged model implementations (one module per family), registry and weight loading.

Import the submodules directly (``jenga.engine.models.registry``, ``.weights``, ``.llama`` ...).
"""
