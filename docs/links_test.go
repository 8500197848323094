package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// markdownFiles returns every Markdown file of the repository (README.md,
// docs/, e2e/, hack/, ...), leaving out hidden directories (.git, .cache),
// build outputs (bin/) and test artifacts.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "artifacts" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	// linkPattern finds inline links and images, [text](target "title");
	// the text may run over a line break.
	linkPattern = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refPattern finds reference definitions, [label]: target.
	refPattern     = regexp.MustCompile(`(?m)^[ ]{0,3}\[[^\]]+\]:[ \t]+<?([^\s>]+)>?`)
	codeSpan       = regexp.MustCompile("`+[^`]*`+")
	headingPattern = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchor     = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	schemePattern  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// markdownText is a Markdown file without its fenced code blocks (their
// lines left empty, so line numbers stay) and without inline code spans.
func markdownText(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	fence := ""
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				fence = ""
			}
			lines[i] = ""
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
			lines[i] = ""
		default:
			lines[i] = codeSpan.ReplaceAllString(line, "")
		}
	}
	return lines
}

// slug is the anchor GitHub gives a heading: lower case, every character
// that is not a letter, mark, digit, connector, space or hyphen dropped,
// spaces turned into hyphens.
func slug(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1") // a link's text only
	heading = strings.ReplaceAll(heading, "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) || unicode.In(r, unicode.Pc):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors a Markdown file defines: its headings'
// slugs (a repeated heading gets -1, -2, ... as on GitHub) and HTML
// anchors.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := headingPattern.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// Every relative link of the repository's Markdown files names a file or
// directory that exists, and every anchor one of the target's headings,
// so that moving a section (README.md into docs/, say) cannot leave a
// link dangling. Links with a scheme (https:, mailto:) are not followed.
func TestMarkdownLinksResolve(t *testing.T) {
	root := repoRoot(t)
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := cache[path]; ok {
			return a
		}
		cache[path] = anchors(t, path)
		return cache[path]
	}
	checked := 0
	for _, file := range markdownFiles(t, root) {
		rel, _ := filepath.Rel(root, file)
		lines := markdownText(t, file)
		text := strings.Join(lines, "\n")
		var matches [][]int
		matches = append(matches, linkPattern.FindAllStringSubmatchIndex(text, -1)...)
		matches = append(matches, refPattern.FindAllStringSubmatchIndex(text, -1)...)
		for _, m := range matches {
			target := text[m[2]:m[3]]
			line := strings.Count(text[:m[2]], "\n") + 1
			if schemePattern.MatchString(target) {
				continue
			}
			checked++
			pathPart, anchor, _ := strings.Cut(target, "#")
			dest := file
			if pathPart != "" {
				dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(pathPart))
				if strings.HasPrefix(pathPart, "/") {
					dest = filepath.Join(root, filepath.FromSlash(pathPart))
				}
				st, err := os.Stat(dest)
				if err != nil {
					t.Errorf("%s:%d: link %s: %s does not exist", rel, line, target, pathPart)
					continue
				}
				if st.IsDir() {
					if anchor != "" {
						t.Errorf("%s:%d: link %s: an anchor into a directory", rel, line, target)
					}
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				continue // a line anchor into source (#L10) is GitHub's, not the file's
			}
			if !anchorsOf(dest)[anchor] {
				destRel, _ := filepath.Rel(root, dest)
				t.Errorf("%s:%d: link %s: %s has no heading with the anchor #%s", rel, line, target, destRel, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link pattern is broken")
	}
	t.Logf("%d relative links checked", checked)
}

// The anchors GitHub gives headings the docs link to.
func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Network and RouterOS access":                                                "network-and-routeros-access",
		"Labs and demos without NVMe/TCP: `--node-connector=loop`":                   "labs-and-demos-without-nvmetcp---node-connectorloop",
		"Health and load (issue 27)":                                                 "health-and-load-issue-27",
		"The node's host NQN":                                                        "the-nodes-host-nqn",
		"make demo, cold (a new machine's first run)":                                "make-demo-cold-a-new-machines-first-run",
		"Who a start waits on: the CPU time of the driver and of kube-apiserver":     "who-a-start-waits-on-the-cpu-time-of-the-driver-and-of-kube-apiserver",
		"e2e: controller start at 10k PVs, 10k VolumeAttachments, 1k Nodes":          "e2e-controller-start-at-10k-pvs-10k-volumeattachments-1k-nodes",
		"Flags (controller) — see [deploy.md](deploy.md)":                            "flags-controller--see-deploymd",
		"`rds_csi_` families":                                                        "rds_csi_-families",
		"Storage fencing: a fenced attachment's held writes when the volume returns": "storage-fencing-a-fenced-attachments-held-writes-when-the-volume-returns",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}
