"""`patchkit import`: bring a monolithic diff, an mbox or an overlay directory into a series."""
