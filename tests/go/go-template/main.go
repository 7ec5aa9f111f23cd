// Go's text/template as the reference driver runs its tag templates
// (aws-ebs-csi-driver pkg/util/template: template.New, its function map,
// Parse, Execute with a *Props), so that the controller's Rust
// implementation is checked against the real thing.
//
// The functions follow the reference's funcs.go as its docs/tagging.md
// describes them: contains, toUpper, toLower, substring, field, index,
// lastIndex; html, js, call and urlquery fail.
//
// Usage: go-template < TEMPLATES > ANSWERS. Each input line is a template
// quoted as Go's %q quotes (only the first tab-separated column is read,
// so an answers file may be fed back); each output line is the template,
// `ok` or `error`, and what it printed (empty for an error), quoted the
// same, tab-separated.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/template"
)

// Props is the reference's data for a volume's tag templates.
type Props struct {
	PVCName      string
	PVCNamespace string
	PVName       string
}

func refused(name string) func(...any) (string, error) {
	return func(...any) (string, error) {
		return "", fmt.Errorf("cannot call '%s' function", name)
	}
}

func functions() template.FuncMap {
	return template.FuncMap{
		"html":     refused("html"),
		"js":       refused("js"),
		"call":     refused("call"),
		"urlquery": refused("urlquery"),
		"contains": func(sub, s string) bool { return strings.Contains(s, sub) },
		"toUpper":  strings.ToUpper,
		"toLower":  strings.ToLower,
		"substring": func(start, end int, s string) string {
			switch {
			case start < 0:
				return s[:end]
			case end < 0 || end > len(s):
				return s[start:]
			default:
				return s[start:end]
			}
		},
		"field": func(delimiter string, n int, s string) (string, error) {
			parts := strings.Split(s, delimiter)
			if n >= len(parts) {
				return "", errors.New("no such part")
			}
			return parts[n], nil
		},
		"index":     func(sub, s string) int { return strings.Index(s, sub) },
		"lastIndex": func(sub, s string) int { return strings.LastIndex(s, sub) },
	}
}

func expand(text string) (string, error) {
	t, err := template.New("tmpl").Funcs(functions()).Parse(text)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	data := &Props{PVCName: "data-db-0", PVCNamespace: "Team-A", PVName: "pvc-5e1f"}
	if err := t.Execute(&out, data); err != nil {
		return "", err
	}
	return out.String(), nil
}

func main() {
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		quoted, _, _ := strings.Cut(lines.Text(), "\t")
		text, err := strconv.Unquote(quoted)
		if err != nil {
			fmt.Fprintf(os.Stderr, "not a quoted template: %s\n", quoted)
			os.Exit(2)
		}
		out, err := expand(text)
		outcome := "ok"
		if err != nil {
			outcome = "error"
		}
		fmt.Printf("%q\t%s\t%q\n", text, outcome, out)
	}
}
