"""Catalog and stock: products, stock items and (later) reservation flags."""
