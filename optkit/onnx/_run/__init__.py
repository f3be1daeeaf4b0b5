"""Per call: the feeds named and checked, the program keyed, traced and compiled, the held weights, the
value-dependent segments and the scanned layers. Needs nothing of loading but its record."""
