"""Example models written against the public contract, as a user would write their own."""
