"""Delta objects: the codec (frames per unit) and how the hub names, plans and chooses them."""
