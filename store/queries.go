package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The store's statements live in its .sql files, embedded here. A file
// holds one or more sections, each opened by a line
//
//	-- name: <statement>      a statement the store runs
//	-- fragment: <fragment>   text that statements put in place with {{<fragment>}}
//
// and followed by a header comment: what it does, and its parameters, one
// line each in the form "--   @name  type  meaning" (or "--   @a, @b  meaning"
// for several). The section's text is
// what follows the header, up to the next section. Fragments are the few
// pieces several statements share (the fence, the backoff condition, the
// epoch); they are put in place once, when the package loads, and each is
// defined once, in the file of what it is about.
//
// Parameters are named (@name), as pgx.NamedArgs names them. A statement
// is rewritten once, at load, to the positional form Postgres takes ($n,
// numbered in the header's order): the text a call sends, and by which
// pgx caches it, is the same for every call and costs no rewrite per call
// (the relay's read is a large statement, read many times a second), and
// it runs unchanged in every QueryExecMode. query.args turns a call's
// pgx.NamedArgs into that order, and refuses a call that leaves one out.
//
//go:embed *.sql
var sqlFiles embed.FS

// query is one statement: its positional text and its parameters' names
// in the order of their numbers.
type query struct {
	name   string
	sql    string
	params []string
	// text is the statement with its names (fragments in place), and
	// header the parameters its header lists: for with.
	text   string
	header []string
}

// args are na's values in q's parameter order. A parameter na does not
// name is an error, and so is a name q does not have: a misspelt name
// would otherwise run as NULL.
func (q query) args(na pgx.NamedArgs) ([]any, error) {
	if len(na) != len(q.params) {
		for k := range na {
			if !slices.Contains(q.params, k) {
				return nil, fmt.Errorf("store: %s: no parameter @%s", q.name, k)
			}
		}
	}
	out := make([]any, len(q.params))
	for i, p := range q.params {
		v, ok := na[p]
		if !ok {
			return nil, fmt.Errorf("store: %s: parameter @%s not given", q.name, p)
		}
		out[i] = v
	}
	return out, nil
}

// queryer is a pool, a transaction or a perTx.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// rowQueryer is a queryer's QueryRow.
type rowQueryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// query runs q on db with na.
func (q query) query(ctx context.Context, db queryer, na pgx.NamedArgs) (pgx.Rows, error) {
	args, err := q.args(na)
	if err != nil {
		return nil, err
	}
	return db.Query(ctx, q.sql, args...)
}

// queryRow runs q on db with na, for one row.
func (q query) queryRow(ctx context.Context, db rowQueryer, na pgx.NamedArgs) pgx.Row {
	args, err := q.args(na)
	if err != nil {
		return errRow{err}
	}
	return db.QueryRow(ctx, q.sql, args...)
}

// exec runs q on db with na for its effect; it returns no rows.
func (q query) exec(ctx context.Context, db queryer, na pgx.NamedArgs) error {
	rows, err := q.query(ctx, db, na)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// errRow is a row that could not be asked for.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// with is q with its /* filter */ comment replaced by cond (dead.sql),
// compiled again: the parameters are those of the conditions written.
func (q query) with(cond string) query {
	c, err := compile(q.name, strings.ReplaceAll(q.text, "/* filter */", cond), q.header)
	if err != nil {
		panic(err) // the conditions are dead.sql's fragments: TestQueries compiles each
	}
	return c
}

// section is one "-- name:" or "-- fragment:" section of a .sql file.
type section struct {
	kind, name string
	params     []string // as the header lists them
	text       string
}

var (
	sectionLine = regexp.MustCompile(`^-- (name|fragment): *([a-z_0-9]+) *$`)
	paramLine   = regexp.MustCompile(`^--\s\s+(@[A-Za-z_][A-Za-z_0-9]*(?:, @[A-Za-z_][A-Za-z_0-9]*)*)`)
	fragmentRef = regexp.MustCompile(`\{\{([a-z_0-9]+)\}\}`)
)

// queries are the statements of the store's .sql files by name, and
// fragments their shared pieces (fragments in place).
var queries, fragments = load(sqlFiles)

// load reads every section of fsys's .sql files and compiles the
// statements. It panics on a malformed file: the files are part of the
// binary, and TestQueries loads them.
func load(fsys fs.FS) (map[string]query, map[string]string) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		panic(err)
	}
	var all []section
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			panic(err)
		}
		all = append(all, parse(n, string(b))...)
	}
	frags := map[string]string{}
	for _, s := range all {
		if s.kind == "fragment" {
			frags[s.name] = s.text
		}
	}
	for n := range frags {
		frags[n] = expand(n, frags[n], frags, 0)
	}
	qs := map[string]query{}
	for _, s := range all {
		if s.kind != "name" {
			continue
		}
		if _, dup := qs[s.name]; dup {
			panic("store: statement " + s.name + " defined twice")
		}
		q, err := compile(s.name, expand(s.name, s.text, frags, 0), s.params)
		if err != nil {
			panic(err)
		}
		qs[s.name] = q
	}
	return qs, frags
}

// parse splits a .sql file into its sections; text before the first is
// the file's own comment.
func parse(file, src string) []section {
	var out []section
	var cur *section
	header := false
	var body []string
	flush := func() {
		if cur != nil {
			cur.text = strings.TrimSpace(strings.Join(body, "\n"))
			out = append(out, *cur)
		}
	}
	for _, line := range strings.Split(src, "\n") {
		if m := sectionLine.FindStringSubmatch(line); m != nil {
			flush()
			cur, header, body = &section{kind: m[1], name: m[2]}, true, nil
			continue
		}
		if cur == nil {
			continue
		}
		if header && strings.HasPrefix(line, "--") {
			cur.headerLine(line)
			continue
		}
		header = false
		body = append(body, line)
	}
	flush()
	for _, s := range out {
		if s.text == "" {
			panic(fmt.Sprintf("store: %s: %s %s is empty", file, s.kind, s.name))
		}
	}
	return out
}

// headerLine adds the parameters a header line lists, if it lists any.
func (s *section) headerLine(line string) {
	m := paramLine.FindStringSubmatch(line)
	if m == nil {
		return
	}
	for _, p := range strings.Split(m[1], ", ") {
		if !slices.Contains(s.params, p[1:]) {
			s.params = append(s.params, p[1:])
		}
	}
}

// expand puts the fragments text names in place.
func expand(name, text string, frags map[string]string, depth int) string {
	if depth > 5 {
		panic("store: fragments nest too deep in " + name)
	}
	out := fragmentRef.ReplaceAllStringFunc(text, func(ref string) string {
		f, ok := frags[ref[2:len(ref)-2]]
		if !ok {
			panic("store: " + name + " names an undefined fragment " + ref)
		}
		return f
	})
	if fragmentRef.MatchString(out) {
		return expand(name, out, frags, depth+1)
	}
	return out
}

// compile rewrites text's @names to $n, n a name's place among params
// (the header's order), keeping only the names text uses. pgx's own
// rewrite (pgx.NamedArgs) tells the placeholders from an @ in a string or
// a comment; the two texts differ only at the placeholders.
func compile(name, text string, params []string) (query, error) {
	used, spans, err := placeholders(text)
	if err != nil {
		return query{}, err
	}
	var order []string
	for _, p := range params {
		if slices.Contains(used, p) {
			order = append(order, p)
		}
	}
	for _, p := range used {
		if !slices.Contains(params, p) {
			return query{}, fmt.Errorf("store: %s: @%s is not among the header's parameters", name, p)
		}
	}
	var b strings.Builder
	last := 0
	for _, s := range spans {
		b.WriteString(text[last:s[0]])
		b.WriteString("$" + strconv.Itoa(slices.Index(order, used[s[2]])+1))
		last = s[1]
	}
	b.WriteString(text[last:])
	return query{name: name, sql: b.String(), params: order, text: text, header: params}, nil
}

// placeholders finds text's @names as pgx.NamedArgs sees them: the names
// in order of first use, and each placeholder's start and end in text
// with its index in used.
func placeholders(text string) (used []string, spans [][3]int, err error) {
	rewritten, _, err := pgx.NamedArgs(nil).RewriteQuery(context.Background(), nil, text, nil)
	if err != nil {
		return nil, nil, err
	}
	for i, j := 0, 0; i < len(text); {
		if j < len(rewritten) && text[i] == rewritten[j] {
			i, j = i+1, j+1
			continue
		}
		end := i + 1
		for end < len(text) && isIdent(text[end]) {
			end++
		}
		p := text[i+1 : end]
		for j++; j < len(rewritten) && rewritten[j] >= '0' && rewritten[j] <= '9'; j++ {
		}
		k := slices.Index(used, p)
		if k < 0 {
			used, k = append(used, p), len(used)
		}
		spans = append(spans, [3]int{i, end, k})
		i = end
	}
	return used, spans, nil
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// stmt is the statement called name; it panics at load when there is
// none.
func stmt(name string) query {
	q, ok := queries[name]
	if !ok {
		panic("store: no statement " + name)
	}
	return q
}

// fragment is the fragment called name, in place.
func fragment(name string) string {
	f, ok := fragments[name]
	if !ok {
		panic("store: no fragment " + name)
	}
	return f
}
