package setting

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Var is one environment variable of a binary's settings table, bound to
// the field it fills: the table is where a setting's name, meaning and
// parsing are written, once, and its default is whatever the field holds
// before the environment is read (the owning package's).
type Var struct {
	// Name is the variable without the binary's prefix (REAP_WORKERS).
	Name string
	// Doc is the setting's meaning, one line of the settings reference.
	Doc string

	field any   // pointer to the field the value is parsed into
	feeds []any // pointers to further fields the binary fills from it
	parse func(string) error
	show  func() string
}

// Feeds declares fields the binary fills from this variable besides its
// own (a package's copy of the environment name, say), so an error a
// package reports on one of them names this variable.
func (v Var) Feeds(fields ...any) Var {
	v.feeds = append(v.feeds[:len(v.feeds):len(v.feeds)], fields...)
	return v
}

// Default is the field's value as shown in the settings reference: what
// it holds when the table is built over a binary's defaults.
func (v Var) Default() string { return v.show() }

// String binds a text setting.
func String(name, doc string, p *string) Var {
	return bind(name, doc, p, func(s string) (string, error) { return s, nil }, func(s string) string { return s })
}

// Duration binds a setting read by time.ParseDuration.
func Duration(name, doc string, p *time.Duration) Var {
	return bind(name, doc, p, time.ParseDuration, ShowDuration)
}

// Int binds a whole-number setting; like strconv.ParseInt with base 0,
// 0x and 0o prefixes are read, and values beyond N's range refused.
func Int[N int | int32 | int64](name, doc string, p *N) Var {
	bits := int(reflect.TypeFor[N]().Size()) * 8
	return bind(name, doc, p, func(s string) (N, error) {
		n, err := strconv.ParseInt(s, 0, bits)
		return N(n), err
	}, func(n N) string { return strconv.FormatInt(int64(n), 10) })
}

// Float32 binds a 32-bit floating-point setting.
func Float32(name, doc string, p *float32) Var {
	return bind(name, doc, p, func(s string) (float32, error) {
		f, err := strconv.ParseFloat(s, 32)
		return float32(f), err
	}, func(f float32) string { return strconv.FormatFloat(float64(f), 'g', -1, 32) })
}

// Bool binds a setting read by strconv.ParseBool.
func Bool(name, doc string, p *bool) Var {
	return bind(name, doc, p, strconv.ParseBool, strconv.FormatBool)
}

// List binds a comma-separated setting; a value of only white space is the
// empty list (which replaces the default).
func List(name, doc string, p *[]string) Var {
	return bind(name, doc, p, func(s string) ([]string, error) {
		if strings.TrimSpace(s) == "" {
			return []string{}, nil
		}
		return strings.Split(s, ","), nil
	}, func(l []string) string { return strings.Join(l, ",") })
}

// Quantity binds a Kubernetes quantity (10Gi, 500M); negative ones are
// refused.
func Quantity(name, doc string, p *resource.Quantity) Var {
	return bind(name, doc, p, func(s string) (resource.Quantity, error) {
		q, err := resource.ParseQuantity(s)
		if err == nil && q.Sign() < 0 {
			err = errors.New("must not be negative")
		}
		return q, err
	}, func(q resource.Quantity) string { return q.String() })
}

func bind[T any](name, doc string, p *T, parse func(string) (T, error), show func(T) string) Var {
	return Var{
		Name: name, Doc: doc, field: p,
		parse: func(s string) error {
			v, err := parse(s)
			if err != nil {
				return err
			}
			*p = v
			return nil
		},
		show: func() string { return show(*p) },
	}
}

// ShowDuration writes d as the settings reference shows it: 1h, 15m, 30s,
// 1h30m (time.Duration.String without its trailing zero units), which
// time.ParseDuration reads back.
func ShowDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Table is a binary's settings: every variable it reads, each under
// Prefix_Name.
type Table struct {
	Prefix string
	Vars   []Var
}

// Key is v's full variable name.
func (t Table) Key(v Var) string { return t.Prefix + "_" + v.Name }

// Read sets every variable lookup finds (os.LookupEnv) into its field;
// a variable not set keeps the field's value, one set to the empty string
// is parsed as such. Every value that does not parse is reported, each
// naming its variable.
func (t Table) Read(lookup func(string) (string, bool)) error {
	var errs []error
	for _, v := range t.Vars {
		s, ok := lookup(t.Key(v))
		if !ok {
			continue
		}
		if err := v.parse(s); err != nil {
			errs = append(errs, &Error{Field: t.Key(v), Err: err})
		}
	}
	return errors.Join(errs...)
}

// KeyOf is the full name of the variable that fills field (a pointer to
// the field), itself or as one it feeds; "" if none does.
func (t Table) KeyOf(field any) string {
	for _, v := range t.Vars {
		if v.field == field {
			return t.Key(v)
		}
		for _, f := range v.feeds {
			if f == field {
				return t.Key(v)
			}
		}
	}
	return ""
}

// Rename is Rename for errors a package's Validate reports on its config
// struct cfg (a pointer to the struct the table's variables fill): each
// Go field name becomes the variable filling that field.
func (t Table) Rename(err error, cfg any) error {
	s := reflect.ValueOf(cfg).Elem()
	return Rename(err, func(field string) string {
		f := s.FieldByName(field)
		if !f.IsValid() {
			return ""
		}
		return t.KeyOf(f.Addr().Interface())
	})
}

// Markdown is the settings reference: a Markdown table of every variable,
// its default (as the table's fields hold it) and its meaning.
func (t Table) Markdown() string {
	var b strings.Builder
	b.WriteString("| Variable | Default | Meaning |\n|---|---|---|\n")
	for _, v := range t.Vars {
		def := "(none)"
		if d := v.Default(); d != "" {
			def = "`" + d + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", t.Key(v), def, strings.ReplaceAll(v.Doc, "|", `\|`))
	}
	return b.String()
}
