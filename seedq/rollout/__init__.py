"""Acting: the one implementation of acting on env steps and booking them (`core`)
and the unroll store it fills (`store`)."""
