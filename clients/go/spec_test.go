package leasehold

import (
	"bufio"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// specKeys reads docs/sidecar-api.yaml as key paths ("paths./v1/...", "components.schemas.
// Acquired.properties.lock") and the values of `enum: [...]` lists, keyed by their path.
func specKeys(t *testing.T) (map[string]bool, map[string][]string) {
	t.Helper()
	file, err := os.Open("../../docs/sidecar-api.yaml")
	if err != nil {
		t.Fatalf("the OpenAPI document: %v", err)
	}
	defer file.Close()
	key := regexp.MustCompile(`^( *)([^ #:'-][^:]*|'[^']*'):(.*)$`)
	keys, enums := map[string]bool{}, map[string][]string{}
	type level struct {
		indent int
		name   string
	}
	var stack []level
	block := -1 // inside a `|` scalar more indented than this
	lines := bufio.NewScanner(file)
	for lines.Scan() {
		line := lines.Text()
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if strings.TrimSpace(line) == "" || (block >= 0 && indent > block) {
			continue
		}
		block = -1
		m := key.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		stack = append(stack, level{indent, strings.Trim(m[2], "'")})
		names := make([]string, len(stack))
		for i, l := range stack {
			names[i] = l.name
		}
		path := strings.Join(names, ".")
		keys[path] = true
		value := strings.TrimSpace(m[3])
		if value == "|" {
			block = indent
		}
		if m[2] == "enum" && strings.HasPrefix(value, "[") {
			for _, v := range strings.Split(strings.Trim(value, "[]"), ",") {
				enums[strings.Join(names[:len(names)-1], ".")] = append(enums[strings.Join(names[:len(names)-1], ".")], strings.TrimSpace(v))
			}
		}
	}
	if len(keys) == 0 {
		t.Fatal("no keys read from the OpenAPI document")
	}
	return keys, enums
}

func jsonFields(value any) []string {
	var fields []string
	kind := reflect.TypeOf(value)
	for i := 0; i < kind.NumField(); i++ {
		if name, _, _ := strings.Cut(kind.Field(i).Tag.Get("json"), ","); name != "" {
			fields = append(fields, name)
		}
	}
	return fields
}

func TestEveryPathAndFieldThisClientUsesIsInTheOpenAPIDocument(t *testing.T) {
	keys, enums := specKeys(t)
	for _, path := range []string{pathAcquire, pathReleaseHandle} {
		if !keys["paths."+path+".post"] {
			t.Errorf("POST %s is not in the OpenAPI document", path)
		}
	}
	for schema, value := range map[string]any{
		"AcquireRequest": acquireRequest{},
		"Acquired":       acquired{},
		"SessionEvent":   sessionEvent{},
		"Released":       released{},
	} {
		for _, field := range jsonFields(value) {
			if !keys["components.schemas."+schema+".properties."+field] {
				t.Errorf("%s.%s is not in the OpenAPI document", schema, field)
			}
		}
	}
	events := enums["components.schemas.SessionEvent.properties.event"]
	for _, event := range []string{"lost", "released"} {
		if !contains(events, event) {
			t.Errorf("session event %q is not in the OpenAPI document (%v)", event, events)
		}
	}
	codes := enums["components.schemas.Error.properties.error.properties.code"]
	for _, code := range []string{CodeTimeout, CodeLost, CodeInvalidLockName, CodeInvalidWait, CodeInvalidTTL,
		CodeUnknownLock, CodeForbidden, CodeShuttingDown, CodeWrongHandle, CodeAPIServer} {
		if !contains(codes, code) {
			t.Errorf("error code %q is not in the OpenAPI document (%v)", code, codes)
		}
	}
}

func contains(list []string, value string) bool {
	for _, v := range list {
		if v == value {
			return true
		}
	}
	return false
}
