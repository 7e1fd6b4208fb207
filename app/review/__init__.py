"""Active labelling: rank unlabelled photos by how much a label would help, ask on a page, keep the answers."""
