package config

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Each setting is declared once, as a field of Config with its tags:
//
//	env      the environment variable
//	default  its value when the variable is unset, as the variable would say it
//	min, max bounds: of a number, of a duration (min only), of a key's
//	         length in bytes, of a schedule's number of attempts
//	secret   never shown: --help and README say "unset", the log says
//	         only whether it was set
//	log      "redact": a URL whose password the log masks
//	help     one line, for --help and README.md's table
//
// Defaults, Load, Settings (what `api --help` prints and README.md's table is
// checked against) and LogAttrs all read these tags, so a new setting is a
// new field and nothing else.

// Setting is one environment variable as `api --help` shows it: its name,
// its default as text, and a line of help. TestREADMEListsEverySetting
// checks README.md's configuration table against Settings.
type Setting struct {
	Name, Default, Help string
}

// Settings lists every variable Load reads, with its default.
func Settings() []Setting {
	d := Defaults()
	var out []Setting
	for _, f := range fields(&d) {
		out = append(out, Setting{Name: f.name, Default: f.String(), Help: f.help})
	}
	return out
}

// Defaults returns the configuration used when no variable is set: every
// field's default tag.
func Defaults() Config {
	var c Config
	for _, f := range fields(&c) {
		if err := f.set(f.def); err != nil {
			// A default that does not parse is this file's bug, and every
			// run of TestDefaults finds it.
			panic(fmt.Sprintf("config: the default of %s: %v", f.name, err))
		}
	}
	return c
}

// LogAttrs returns the settings as log attributes: secrets only as whether
// they were set, URLs with their passwords masked.
func (c Config) LogAttrs() []any {
	attrs := []any{
		slog.Bool("livemode", c.Livemode()),
		slog.String("outbox_retry_schedule", c.RetrySchedule().Round(time.Second).String()),
	}
	d := Defaults()
	defaults := fields(&d)
	for i, f := range fields(&c) {
		key := strings.ToLower(f.name)
		switch {
		case f.secret:
			attrs = append(attrs, slog.Bool(key+"_set", !reflect.DeepEqual(f.v.Interface(), defaults[i].v.Interface())))
		case f.redact:
			attrs = append(attrs, slog.String(key, redact(f.String())))
		default:
			attrs = append(attrs, slog.String(key, f.String()))
		}
	}
	return attrs
}

// field is one setting: its tags, and its field of a Config.
type field struct {
	name, def, help string
	min, max        string
	secret, redact  bool
	v               reflect.Value
}

// fields returns c's settings in declaration order, the nested settings
// structs (Stripe, Sim) in their place.
func fields(c *Config) []field {
	var out []field
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := range v.NumField() {
			sf, fv := v.Type().Field(i), v.Field(i)
			name, ok := sf.Tag.Lookup("env")
			if !ok {
				if fv.Kind() == reflect.Struct {
					walk(fv)
				}
				continue
			}
			out = append(out, field{
				name: name, def: sf.Tag.Get("default"), help: sf.Tag.Get("help"),
				min: sf.Tag.Get("min"), max: sf.Tag.Get("max"),
				secret: sf.Tag.Get("secret") == "true", redact: sf.Tag.Get("log") == "redact",
				v: fv,
			})
		}
	}
	walk(reflect.ValueOf(c).Elem())
	return out
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	scheduleType = reflect.TypeFor[[]time.Duration]()
	levelType    = reflect.TypeFor[slog.Level]()
	bytesType    = reflect.TypeFor[[]byte]()
)

// set parses raw into the field, within its bounds. The error names the
// variable, and repeats the value unless the setting is a secret.
func (f field) set(raw string) error {
	shown := fmt.Sprintf("%s=%q", f.name, raw)
	if f.secret {
		shown = f.name
	}
	switch f.v.Type() {
	case durationType:
		d, err := time.ParseDuration(raw)
		lo, _ := time.ParseDuration(f.min)
		if err != nil || d < lo {
			return fmt.Errorf("%s: want a duration of at least %s, like 5s or 24h", shown, duration(lo))
		}
		f.v.SetInt(int64(d))
	case scheduleType:
		lo, _ := strconv.Atoi(f.min)
		hi, _ := strconv.Atoi(f.max)
		var schedule []time.Duration
		for part := range strings.SplitSeq(raw, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(part))
			if err != nil || d < 0 {
				schedule = nil
				break
			}
			schedule = append(schedule, d)
		}
		if len(schedule) < lo || len(schedule) > hi {
			return fmt.Errorf("%s: want %d to %d comma-separated durations, like 0s,5s,5m", shown, lo, hi)
		}
		f.v.Set(reflect.ValueOf(schedule))
	case levelType:
		var l slog.Level
		if err := l.UnmarshalText([]byte(raw)); err != nil {
			return fmt.Errorf("%s: want debug, info, warn or error", shown)
		}
		f.v.Set(reflect.ValueOf(l))
	case bytesType:
		key, err := base64.StdEncoding.DecodeString(raw)
		least, _ := strconv.Atoi(f.min)
		if err != nil || len(key) < least {
			return fmt.Errorf("%s: want the standard base64 of at least %d random bytes, like the output of `openssl rand -base64 %d`", shown, least, least)
		}
		f.v.SetBytes(key)
	default:
		switch f.v.Kind() {
		case reflect.String:
			f.v.SetString(raw)
		case reflect.Bool:
			b, err := strconv.ParseBool(raw)
			if err != nil {
				return fmt.Errorf("%s: want true or false", shown)
			}
			f.v.SetBool(b)
		case reflect.Int, reflect.Int32, reflect.Int64:
			lo, _ := strconv.ParseInt(f.min, 10, 64)
			hi, _ := strconv.ParseInt(f.max, 10, 64)
			n, err := strconv.ParseInt(raw, 10, 64)
			if err != nil || n < lo || n > hi {
				return fmt.Errorf("%s: want an integer from %d to %d", shown, lo, hi)
			}
			f.v.SetInt(n)
		case reflect.Float64:
			lo, _ := strconv.ParseFloat(f.min, 64)
			hi, _ := strconv.ParseFloat(f.max, 64)
			x, err := strconv.ParseFloat(raw, 64)
			if err != nil || x < lo || x > hi {
				return fmt.Errorf("%s: want a number from %s to %s", shown, f.min, f.max)
			}
			f.v.SetFloat(x)
		default:
			panic(fmt.Sprintf("config: %s has a type settings cannot read: %s", f.name, f.v.Type()))
		}
	}
	return nil
}

// String is the field's value as its variable would say it ("" for a
// secret): what --help and README show as the default.
func (f field) String() string {
	switch {
	case f.secret:
		return ""
	case f.v.Type() == durationType:
		return duration(time.Duration(f.v.Int()))
	case f.v.Type() == scheduleType:
		return formatSchedule(f.v.Interface().([]time.Duration))
	case f.v.Type() == levelType:
		return strings.ToLower(f.v.Interface().(slog.Level).String())
	default:
		return fmt.Sprint(f.v.Interface())
	}
}

// duration writes d as README does: 2m rather than 2m0s.
func duration(d time.Duration) string {
	s := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if strings.HasSuffix(s, zero) && len(s) > len(zero) && strings.ContainsAny(s[:len(s)-len(zero)], "hm") {
			s = strings.TrimSuffix(s, zero)
		}
	}
	return s
}
