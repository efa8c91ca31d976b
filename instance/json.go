package instance

import (
	"encoding/base64"
	"slices"
	"strconv"
	"time"

	"github.com/computeql/computeql/jsonvalue"
	"github.com/computeql/computeql/quota"
)

// Every write of an instance stores its spec and status as JSON. These appenders write the
// bytes encoding/json writes for them (the tests hold them to it, field by field), without
// reflection and without encoding/json's second scan of every time it encodes: on a create
// that was a twelfth of the API's instructions.

// AppendJSON appends the spec as encoding/json encodes it.
func (s *Spec) AppendJSON(b []byte) ([]byte, error) {
	w := jsonObject{b: b}
	w.str("name", s.Name)
	if s.Description != "" {
		w.str("description", s.Description)
	}
	array(&w, "tags", s.Tags, func(b []byte, t Tag) ([]byte, error) {
		o := jsonObject{b: b}
		o.str("name", t.Name)
		o.str("value", t.Value)
		return o.end(), nil
	})
	w.str("region", s.RegionID)
	w.str("networkId", s.NetworkID)
	w.str("flavorId", s.FlavorID)
	w.str("imageId", s.ImageID)
	if s.SSHCertificateAuthorityID != "" {
		w.str("sshCertificateAuthorityId", s.SSHCertificateAuthorityID)
	}
	w.key("networking")
	net := jsonObject{b: w.b}
	net.strs("securityGroupIds", s.Networking.SecurityGroupIDs)
	if s.Networking.PublicIP {
		net.key("publicIP")
		net.b = append(net.b, "true"...)
	}
	net.strs("allowedSourceAddresses", s.Networking.AllowedSourceAddresses)
	w.b = net.end()
	if len(s.UserData) > 0 {
		w.key("userData")
		w.b = append(w.b, '"')
		w.b = base64.StdEncoding.AppendEncode(w.b, s.UserData)
		w.b = append(w.b, '"')
	}
	w.strs("sshPublicKeys", s.SSHPublicKeys)
	w.intOmitted("rebuildGeneration", s.RebuildGeneration)
	w.intOmitted("resizeGeneration", s.ResizeGeneration)
	w.trueOnly("resizeRestart", s.ResizeRestart)
	w.trueOnly("deletionProtection", s.DeletionProtection)
	w.timeOmitted("expiresAt", s.ExpiresAt)
	if s.ExpiryAction != "" {
		w.str("expiryAction", string(s.ExpiryAction))
	}
	if s.Power != "" {
		w.str("power", string(s.Power))
	}
	w.key("charge")
	w.amounts(s.Charge)
	w.time("createdAt", s.CreatedAt)
	w.str("createdBy", s.CreatedBy)
	w.time("updatedAt", s.UpdatedAt)
	w.str("updatedBy", s.UpdatedBy)
	w.timeOmitted("deletedAt", s.DeletedAt)
	return w.end(), w.err
}

// AppendJSON appends the status as encoding/json encodes it.
func (s *Status) AppendJSON(b []byte) ([]byte, error) {
	w := jsonObject{b: b}
	w.str("provisioningStatus", string(s.ProvisioningStatus))
	w.str("healthStatus", string(s.HealthStatus))
	w.str("powerState", string(s.PowerState))
	for _, f := range [...]struct{ key, v string }{{"privateIP", s.PrivateIP}, {"publicIP", s.PublicIP}, {"macAddress", s.MACAddress}} {
		if f.v != "" {
			w.str(f.key, f.v)
		}
	}
	array(&w, "conditions", s.Conditions, func(b []byte, c Condition) ([]byte, error) {
		o := jsonObject{b: b}
		o.str("type", c.Type)
		o.str("status", string(c.Status))
		o.str("reason", c.Reason)
		o.str("message", c.Message)
		o.time("lastTransitionTime", c.LastTransitionTime)
		return o.end(), o.err
	})
	w.key("observedGeneration")
	w.b = strconv.AppendInt(w.b, s.ObservedGeneration, 10)
	return w.end(), w.err
}

// jsonObject appends one object's entries; err is the first time that could not be encoded.
type jsonObject struct {
	b       []byte
	entries int
	err     error
}

func (w *jsonObject) key(k string) {
	if w.entries == 0 {
		w.b = append(w.b, '{')
	} else {
		w.b = append(w.b, ',')
	}
	w.entries++
	w.b = append(w.b, '"')
	w.b = append(w.b, k...)
	w.b = append(w.b, '"', ':')
}

func (w *jsonObject) end() []byte {
	if w.entries == 0 {
		return append(w.b, '{', '}')
	}
	return append(w.b, '}')
}

func (w *jsonObject) str(k, v string) {
	w.key(k)
	w.b = jsonvalue.AppendString(w.b, v)
}

// array appends items as an array under key, each by item; with omitempty, none when there
// are no items.
func array[T any](w *jsonObject, key string, items []T, item func(b []byte, v T) ([]byte, error)) {
	if len(items) == 0 {
		return
	}
	w.key(key)
	w.b = append(w.b, '[')
	for i, v := range items {
		if i > 0 {
			w.b = append(w.b, ',')
		}
		var err error
		if w.b, err = item(w.b, v); err != nil && w.err == nil {
			w.err = err
		}
	}
	w.b = append(w.b, ']')
}

// strs is a []string with omitempty.
func (w *jsonObject) strs(k string, vs []string) {
	array(w, k, vs, func(b []byte, v string) ([]byte, error) { return jsonvalue.AppendString(b, v), nil })
}

func (w *jsonObject) intOmitted(k string, v int64) {
	if v != 0 {
		w.key(k)
		w.b = strconv.AppendInt(w.b, v, 10)
	}
}

func (w *jsonObject) trueOnly(k string, v bool) {
	if v {
		w.key(k)
		w.b = append(w.b, "true"...)
	}
}

func (w *jsonObject) time(k string, t time.Time) {
	w.key(k)
	var err error
	if w.b, err = jsonvalue.AppendTime(w.b, t); err != nil && w.err == nil {
		w.err = err
	}
}

func (w *jsonObject) timeOmitted(k string, t *time.Time) {
	if t != nil {
		w.time(k, *t)
	}
}

// amounts appends a quota.Amounts as encoding/json encodes a map: null when nil, the keys in
// order.
func (w *jsonObject) amounts(a quota.Amounts) {
	if a == nil {
		w.b = append(w.b, "null"...)
		return
	}
	var kinds [8]quota.Kind
	keys := kinds[:0]
	for k := range a {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	w.b = append(w.b, '{')
	for i, k := range keys {
		if i > 0 {
			w.b = append(w.b, ',')
		}
		w.b = jsonvalue.AppendString(w.b, string(k))
		w.b = append(w.b, ':')
		w.b = strconv.AppendInt(w.b, a[k], 10)
	}
	w.b = append(w.b, '}')
}
