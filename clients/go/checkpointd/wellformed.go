package checkpointd

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// checkWellFormed refuses a request holding a string that is not well-formed
// UTF-8 before it is sent: the protobuf runtime would refuse to marshal it and
// the call would fail with codes.Internal. An id field (thread_id,
// checkpoint_id, request_id, ...) gets INVALID_ID, any other string
// INVALID_ARGUMENT, as the daemon answers them.
func checkWellFormed(msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil
	}
	return checkMessage(m.ProtoReflect())
}

func checkMessage(m protoreflect.Message) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = checkField(fd, v)
		return err == nil
	})
	return err
}

func checkField(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch {
	case fd.IsMap():
		var err error
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			if fd.MapKey().Kind() == protoreflect.StringKind {
				err = checkString(fd, k.String())
			}
			if err == nil {
				err = checkScalar(fd.MapValue(), mv)
			}
			return err == nil
		})
		return err
	case fd.IsList():
		list := v.List()
		for i := 0; i < list.Len(); i++ {
			if err := checkScalar(fd, list.Get(i)); err != nil {
				return err
			}
		}
		return nil
	default:
		return checkScalar(fd, v)
	}
}

func checkScalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return checkString(fd, v.String())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return checkMessage(v.Message())
	default:
		return nil
	}
}

func checkString(fd protoreflect.FieldDescriptor, s string) error {
	if utf8.ValidString(s) {
		return nil
	}
	name := string(fd.Name())
	meta := map[string]string{"field": name}
	if name == "id" || strings.HasSuffix(name, "_id") || strings.HasSuffix(name, "_ids") {
		return newError(CodeInvalidID, codes.InvalidArgument,
			fmt.Sprintf("invalid %s: not well-formed UTF-8 (ids are well-formed Unicode strings)", name), meta)
	}
	return invalidArgument(fmt.Sprintf("%s is not well-formed UTF-8", name), meta)
}
