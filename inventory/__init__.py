"""Catalog and stock: products, stock items and reservation flags."""
