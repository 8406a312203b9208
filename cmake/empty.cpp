// libmoekit.so is the layers' archives, whole; a shared library target needs one source of its own.
