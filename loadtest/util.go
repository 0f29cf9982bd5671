package main

import (
	"cmp"
	"maps"
	"slices"
)

func sortedKeys[M ~map[K]V, K cmp.Ordered, V any](m M) []K {
	return slices.Sorted(maps.Keys(m))
}
