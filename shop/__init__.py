"""The storefront and shopper accounts."""
