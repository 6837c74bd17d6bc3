"""Oscar's checkout, forked to record a payment (bench.oscar.checkout.views)."""
