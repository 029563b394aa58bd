"""One module per family of host settings; ``hpcvm.tune.registry`` lists them."""
