package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// fence is a line that opens or closes a code block: three or more backticks or tildes,
// indented by at most three spaces, and what follows them.
var fence = regexp.MustCompile("^ {0,3}(```+|~~~+)(.*)$")

// link is an inline link or image, [text](target) or ![alt](target "title").
var link = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// inlineCode is a code span, whose text is not Markdown.
var inlineCode = regexp.MustCompile("`[^`]*`")

// TestMarkdown checks every Markdown file of the repository as a reader's renderer would see
// it: each code block is closed (an unclosed one swallows everything after it, headings and
// all), a fence line inside a block that carries text does not close it and so is reported,
// and each relative link names a file or directory that exists.
func TestMarkdown(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "*.md").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	files := strings.Fields(string(out))
	if len(files) == 0 {
		t.Fatal("git lists no Markdown files")
	}
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			for _, problem := range checkMarkdown(t, file) {
				t.Error(problem)
			}
		})
	}
}

func checkMarkdown(t *testing.T, file string) []string {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var problems []string
	var open string // the fence of the block we are in; "" outside
	openedAt := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := fence.FindStringSubmatch(line); m != nil {
			marker, rest := m[1], strings.TrimSpace(m[2])
			switch {
			case open == "":
				open, openedAt = marker, n
			case marker[0] == open[0] && len(marker) >= len(open) && rest == "":
				open = ""
			case marker[0] == open[0] && rest != "":
				problems = append(problems, lineRef(file, n)+": a fence with text after it does not close the block opened at line "+
					strconv.Itoa(openedAt)+"; put the text on a line of its own")
			}
			continue
		}
		if open != "" {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			if _, err := os.Stat(filepath.Join(filepath.Dir(file), target)); err != nil {
				problems = append(problems, lineRef(file, n)+": link to "+m[1]+", which does not exist")
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if open != "" {
		problems = append(problems, lineRef(file, openedAt)+": a code block that is never closed")
	}
	return problems
}

func lineRef(file string, n int) string { return file + ":" + strconv.Itoa(n) }

// The checker finds what breaks a rendering: a block never closed, a fence with text that
// therefore opens rather than closes, a dead relative link; and accepts what is fine.
func TestCheckMarkdown(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "there.md"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"closed blocks, live links", "# T\n```json\n{}\n```\n~~~\n```\n~~~\nSee [there](there.md#x), [web](https://x.y/z), [up](#t), `[no](code.md)`.\n", nil},
		{"a fence with text", "```json\n{}\n``` and then prose\n## Hidden\n```\n", []string{":3: a fence with text after it does not close the block opened at line 1; put the text on a line of its own"}},
		{"never closed", "text\n```sh\nmake run\n", []string{":2: a code block that is never closed"}},
		{"dead link", "See [gone](gone.md) and ![pic](img/none.png \"t\").\n", []string{":1: link to gone.md, which does not exist", ":1: link to img/none.png, which does not exist"}},
		{"links inside blocks are code", "```\n[gone](gone.md)\n```\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, "doc.md")
			if err := os.WriteFile(file, []byte(tc.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			got := checkMarkdown(t, file)
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %q", got, tc.want)
			}
			for i := range got {
				if got[i] != file+tc.want[i] {
					t.Errorf("problem %q, want %q", got[i], file+tc.want[i])
				}
			}
		})
	}
}
