package rdssim

import (
	"fmt"
	"strings"
)

// parseChoice parses s as one of choices, "" as the first (the default);
// what names the option in the error.
func parseChoice[T ~string](what, s string, choices ...T) (T, error) {
	if s == "" {
		return choices[0], nil
	}
	names := make([]string, len(choices))
	for i, c := range choices {
		if string(c) == s {
			return c, nil
		}
		names[i] = string(c)
	}
	return "", fmt.Errorf("%s %q: want %s", what, s, strings.Join(names, ", "))
}
