"""Push benchmark rank: nothing to do; the push is what is measured."""
